# Functions for payloads that the device tool carries to the GPU machine (an Ubuntu image with
# glibc, libstdc++, python3 and CUDA, but none of the Debian libraries exo links, and no network).
# Sourced, not run: the packing half by the scripts that lay a payload out here
# (scripts/carry-e2e-device.sh, bench/cuda/carry.sh, bench/cuda/carry-mixed.sh), the unpacking
# half by the payload's run.sh there.
# Binaries and libraries travel xz-compressed with the x86 filter; they are unpacked with python3's
# lzma (the image may lack the xz command).

# The sonames any Ubuntu 24.04 image with python3 (ssl, ffi, lzma, uuid) and apt (gnutls, gcrypt,
# systemd, zstd, lz4; pcre2 through grep) holds: a CARRY_SKIP_LIBS for payloads that trust it.
CARRY_IMAGE_LIBS='libz|liblzma|libzstd|liblz4|libssl|libcrypto|libffi|libuuid|libgnutls|libnettle|libhogweed'
CARRY_IMAGE_LIBS+='|libgmp|libtasn1|libp11-kit|libidn2|libgcrypt|libgpg-error|libsystemd|libcap|libpcre2-8'

# carry_begin FINAL: a fresh FINAL.tmp to lay a payload out in (printed); carry_finish FINAL then
# swaps it in for FINAL, so a payload folder is never half written.
carry_begin() {
  rm -rf "$1.tmp" && mkdir -p "$1.tmp" && echo "$1.tmp"
}
carry_finish() {
  rm -rf "$1.old"; if [ -d "$1" ]; then mv "$1" "$1.old"; fi
  mv "$1.tmp" "$1" && rm -rf "$1.old" && du -sh "$1"
}

# carry_tokenizers DEST NAME...: the tokenizers NAME (from scripts/tokenizers.sh's .cache, this
# checkout's or main's) as DEST/NAME/tokenizer_config.json and DEST/NAME/tokenizer.json.xz.
carry_tokenizers() {
  local dest=$1 tok=.cache/tokenizers t; shift
  [ -d $tok ] || tok=/work/main/.cache/tokenizers
  for t in "$@"; do
    mkdir -p "$dest/$t"
    cp "$tok/$t/tokenizer_config.json" "$dest/$t/" &&
      xz -T2 -6 -c "$tok/$t/tokenizer.json" > "$dest/$t/tokenizer.json.xz" || return 1
  done
}

# carry_pack BIN DEST: BIN stripped and compressed into DEST.xz.
carry_pack() {
  strip -o "$2.tmp" "$1" && xz -T2 -6 --x86 --lzma2=preset=6 -c "$2.tmp" > "$2.xz" && rm "$2.tmp"
}

# carry_shared_libs DEST BIN...: every shared library the binaries link, outside glibc,
# libstdc++/libgcc and CUDA (the image has those), as DEST/<soname>.xz. CARRY_SKIP_LIBS, an
# extended regex, names more sonames to leave to the image (or to a replacement carried instead).
carry_shared_libs() {
  local dest=$1; shift
  mkdir -p "$dest"
  for bin in "$@"; do ldd "$bin"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u |
    grep -vE '^(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so|/cuda' |
    grep -vE "^(${CARRY_SKIP_LIBS:-no-such-lib})\.so" |
    while read -r soname path; do xz -T1 -6 --x86 --lzma2=preset=6 -c "$path" > "$dest/$soname.xz"; done
}

# carry_unpack FILE.xz... : each FILE.xz becomes FILE (the .xz removed); files already unpacked
# (a second run on the same tree) are left as they are.
carry_unpack() {
  [ $# -gt 0 ] || return 0
  python3 - "$@" <<'EOF'
import lzma, os, sys
for f in sys.argv[1:]:
    if not f.endswith('.xz') or not os.path.exists(f):
        continue
    with lzma.open(f) as src, open(f[:-3] + '.part', 'wb') as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    os.replace(f[:-3] + '.part', f[:-3])
    os.remove(f)
EOF
}

# carry_cuda_libdir: the folder holding libcublas.so.13 (CUDA toolkit, else the pip wheels that
# PyTorch uses), printed; nothing when there is none.
carry_cuda_libdir() {
  local wheels
  wheels=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)
  for f in /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda*/lib*/libcublas.so.13 \
    ${wheels:+$wheels/nvidia/cu13/lib/libcublas.so.13} ${wheels:+$wheels/nvidia/cublas/lib/libcublas.so.13}; do
    if [ -e "$f" ]; then dirname "$f"; return 0; fi
  done
}

# carry_wrapper WRAPPER BIN LIBPATH: WRAPPER runs BIN with LIBPATH first in LD_LIBRARY_PATH, by
# exec (the same process id, which tests that look for a node's runners rely on). Only exo's own
# binaries get the carried libraries: system tools keep the image's.
carry_wrapper() {
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' "$3" "$2" > "$1"
  chmod +x "$1" "$2"
}
