#!/usr/bin/env python3
"""Innermost loops of a compiled kernel function, from `objdump -d` (x86-64 or aarch64): for
each backward branch that encloses no other, the instruction count of the body, how many of
them are the dot/multiply instructions named, and the size of the smallest loop around it (the
group loop: its extra instructions are the per-group cost; a loop that holds several inner
loops, e.g. both halves of a block, counts them all). Used for the instructions-per-128-weights table of
bench/RESULTS.md (issue 25).   loops.py OBJDUMP OBJECT FUNCTION DOT_MNEMONIC[,...]"""
import re, subprocess, sys

objdump, obj, func, dots = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(',')
text = subprocess.run([objdump, '-d', '--no-show-raw-insn', obj], capture_output=True, text=True).stdout
body, inside = [], False
for line in text.splitlines():
    if re.match(r'^[0-9a-f]+ <(.+)>:$', line):
        inside = line.split('<')[1].rstrip('>:') == func
        continue
    m = re.match(r'^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$', line)
    if inside and m:
        body.append((int(m.group(1), 16), m.group(2), m.group(3)))
if not body:
    sys.exit(f'{func}: not found in {obj}')
addrs = [a for a, _, _ in body]
loops = []
for i, (a, mn, ops) in enumerate(body):
    if not (mn.startswith('j') or mn.startswith('b') or mn in ('cbnz', 'cbz', 'tbnz', 'tbz')):
        continue
    t = re.search(r'\b([0-9a-f]+) <', ops)
    if not t or int(t.group(1), 16) >= a or int(t.group(1), 16) < addrs[0]:
        continue
    loops.append((addrs.index(int(t.group(1), 16)), i))
inner = [(s, e) for s, e in loops if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in loops)]
for s, e in inner:
    ins = body[s:e + 1]
    nd = sum(1 for _, mn, _ in ins if mn in dots)
    if nd:
        mix = {}
        for _, mn, _ in ins: mix[mn] = mix.get(mn, 0) + 1
        top = ' '.join(f'{k}:{v}' for k, v in sorted(mix.items(), key=lambda kv: -kv[1])[:8])
        outer = [(s2, e2) for s2, e2 in loops if s2 <= s and e <= e2 and (s2, e2) != (s, e)]
        enc = min(outer, key=lambda se: se[1] - se[0]) if outer else None
        around = f', enclosing loop {enc[1] - enc[0] + 1} instructions' if enc else ''
        print(f'{func} loop @{body[s][0]:x}: {len(ins)} instructions, {nd} {"/".join(dots)}{around}  [{top}]')
