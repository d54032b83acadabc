#!/usr/bin/env python3
"""Counts test results from meson testlog.json files and prints 'N passed, N failed, N skipped'.

A meson test that speaks TAP contributes one result per 'ok'/'not ok' line of its output; any
other test contributes one result. Exit status 1 if anything failed or nothing ran."""
import json
import re
import sys

TAP = re.compile(r'^(not ok|ok)\b[^#]*(#\s*(SKIP|TODO)\b)?', re.I)


def count(path, tot):
    try:
        lines = open(path, encoding='utf-8', errors='replace').read().splitlines()
    except OSError:
        print(f'count-tests: {path} missing', file=sys.stderr)
        tot['failed'] += 1
        return
    for line in lines:
        if not line.strip():
            continue
        t = json.loads(line)
        res = t.get('result', '')
        cases = [TAP.match(l) for l in t.get('stdout', '').splitlines()]
        cases = [m for m in cases if m]
        if cases:
            for m in cases:
                if m.group(3) and m.group(3).upper() == 'SKIP':
                    tot['skipped'] += 1
                elif m.group(1).lower() == 'ok':
                    tot['passed'] += 1
                else:
                    tot['failed'] += 1
            # a crash after the last TAP line still counts as a failure
            if res not in ('OK', 'SKIP', 'EXPECTEDFAIL') and all(
                    m.group(1).lower() == 'ok' for m in cases):
                tot['failed'] += 1
        elif res in ('OK', 'EXPECTEDFAIL'):  # should_fail: true, and it failed
            tot['passed'] += 1
        elif res == 'SKIP':
            tot['skipped'] += 1
        else:
            tot['failed'] += 1


def main():
    tot = {'passed': 0, 'failed': 0, 'skipped': 0}
    for p in sys.argv[1:]:
        count(p, tot)
    print(f"{tot['passed']} passed, {tot['failed']} failed, {tot['skipped']} skipped")
    return 1 if tot['failed'] or tot['passed'] == 0 else 0


if __name__ == '__main__':
    sys.exit(main())
