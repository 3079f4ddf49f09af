#!/usr/bin/env python3
"""Plots a bench/dist_scaling.sh log as an SVG bar chart: decode tok/s relative to one node, per
model, mode, node count and link. Standard library only (the GPU machine and CI have no
matplotlib guarantee).   python3 bench/dist_plot.py LOG > OUT.svg"""
import re
import sys

rows = []  # (model, mode, nodes, link, batch, tok/s)
model = link = None
for line in open(sys.argv[1]):
    m = re.match(r'== (\S+) shape', line)
    if m:
        model = m.group(1)
    m = re.match(r'== (tensor|pipeline) x(\d+), (.*) \(', line)
    if m:
        link = 'direct' if m.group(3).startswith('direct') else m.group(3).replace('net ', '').replace(' one way', '')
    m = re.match(r'dist (tensor|pipeline) x(\d+) decode tg\d+ b(\d+): ([\d.]+) tok/s', line)
    if m and model:
        rows.append((model, m.group(1), int(m.group(2)), link, int(m.group(3)), float(m.group(4))))

base = {(r[0], r[1], r[4]): r[5] for r in rows if r[2] == 1}
groups = {}
for r in rows:
    groups.setdefault((r[0], r[1], r[4]), []).append(r)
bar, gap, left, top, height = 14, 30, 320, 40, 180
width = left + max(len(v) for v in groups.values()) * (bar + 4) + 200
svg = []
y = top
for key, rs in groups.items():
    b = base.get(key, 0) or 1
    svg.append(f'<text x="10" y="{y + height / 2}" font-size="12">{key[0]} {key[1]} batch {key[2]} '
               f'(1 node {b:.1f} tok/s)</text>')
    svg.append(f'<line x1="{left}" y1="{y + height}" x2="{width - 20}" y2="{y + height}" stroke="black"/>')
    for k in (1, 2, 3):
        yy = y + height - k * height / 3.5
        svg.append(f'<line x1="{left}" y1="{yy}" x2="{width - 20}" y2="{yy}" stroke="#ccc"/>'
                   f'<text x="{left - 30}" y="{yy + 4}" font-size="10">{k}x</text>')
    x = left + 4
    for r in rs:
        h = min(r[5] / b, 3.5) * height / 3.5
        color = {'direct': '#4a7', '0.1 ms / 10 Gbit/s': '#47a', '1 ms / 1 Gbit/s': '#a74'}.get(r[3], '#777')
        svg.append(f'<rect x="{x}" y="{y + height - h}" width="{bar}" height="{h}" fill="{color}">'
                   f'<title>{r[2]} nodes, {r[3]}: {r[5]} tok/s ({r[5] / b:.2f}x)</title></rect>'
                   f'<text x="{x + 2}" y="{y + height + 12}" font-size="9">{r[2]}</text>')
        x += bar + 4
    y += height + gap + 20
legend = ''.join(f'<rect x="{10 + i * 170}" y="10" width="10" height="10" fill="{c}"/>'
                 f'<text x="{24 + i * 170}" y="19" font-size="11">{n}</text>'
                 for i, (n, c) in enumerate([('direct loopback', '#4a7'), ('0.1 ms / 10 Gbit/s', '#47a'),
                                              ('1 ms / 1 Gbit/s', '#a74')]))
print(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}">{legend}{"".join(svg)}</svg>')
