#!/usr/bin/env python3
"""Copies a node binary with its embedded ICU data (the symbol icudt<N>_dat, ~33 MB) zeroed, for
device payloads (scripts/carry-e2e-device.sh): compressed, node shrinks from 21 MB to 13 MB.
ICU then finds no data: Intl's locale formatting throws ("Icu error"); Unicode property regexes,
NFC/NFD normalization and Date keep working (ICU carries those in code). The API e2e suite passes
on such a node; anything else that runs on it must be checked the same way.
    node-without-icu.py SRC DST    SRC must still have its symbol table (not stripped)"""
import re
import subprocess
import sys


def main(src, dst):
    symbols = subprocess.run(['nm', '-S', src], capture_output=True, text=True, check=True).stdout
    found = [(int(f[0], 16), int(f[1], 16)) for f in (line.split() for line in symbols.splitlines())
             if len(f) == 4 and re.fullmatch(r'icudt\d+_dat', f[3])]
    if len(found) != 1:
        sys.exit(f'{src}: no single icudt*_dat symbol (stripped, or built with small ICU?)')
    addr, size = found[0]
    data = bytearray(open(src, 'rb').read())
    segments = subprocess.run(['readelf', '-lW', src], capture_output=True, text=True, check=True).stdout
    for f in (line.split() for line in segments.splitlines()):
        if f and f[0] == 'LOAD' and int(f[2], 16) <= addr < int(f[2], 16) + int(f[4], 16):
            at = addr - int(f[2], 16) + int(f[1], 16)
            data[at:at + size] = bytes(size)
            break
    else:
        sys.exit(f'{src}: icudt*_dat lies in no loaded segment')
    open(dst, 'wb').write(data)
    print(f'{dst}: {size >> 20} MiB of ICU data zeroed')


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
