#!/usr/bin/env bash
# scripts/carry_headers.sh: stages, in the git-ignored .carry/, the Debian pieces the GPU machine
# lacks, so a device run that carries ".carry" can build and run everything there:
#   .carry/include: xxhash.h (header-only; cache/, scheduler/, engine/), and for the server and the
#                   tokenizer httplib.h, pcre2.h and the headers httplib.h pulls in with the
#                   features Debian built it with (openssl, zlib, brotli);
#   .carry/lib:     Debian's libcpp-httplib.so.0.11 and libpcre2-8.so.0 (the GPU machine's own
#                   cpp-httplib is another version, with another ABI) and pkg-config files for both.
# On the GPU machine: PKG_CONFIG_PATH=$PWD/.carry/lib/pkgconfig and -I$PWD/.carry/include (see
# gpu_check.sh's `serve` phase); the executables find the two libraries through their build rpath.
set -euo pipefail
cd "$(dirname "$0")/.."
C=$PWD/.carry
mkdir -p "$C/include/openssl" "$C/lib/pkgconfig"
cp /usr/include/xxhash.h /usr/include/httplib.h /usr/include/pcre2.h /usr/include/zlib.h /usr/include/zconf.h "$C/include/"
cp -r /usr/include/openssl/. "$C/include/openssl/"
cp /usr/include/x86_64-linux-gnu/openssl/*.h "$C/include/openssl/"
cp -r /usr/include/brotli "$C/include/"
lib=/usr/lib/x86_64-linux-gnu
cp -P "$lib"/libcpp-httplib.so* "$lib"/libpcre2-8.so* "$C/lib/"
cp "$lib/libcpp-httplib.so.0.11.4" "$lib/libpcre2-8.so.0.11.2" "$C/lib/"
rm -f "$C"/lib/*.a
cat > "$C/lib/pkgconfig/cpp-httplib.pc" <<'PC'
prefix=${pcfiledir}/../..
Name: cpp-httplib
Description: Debian's cpp-httplib 0.11.4, carried to the GPU machine
Version: 0.11.4
Libs: -L${prefix}/lib -lcpp-httplib
Cflags: -I${prefix}/include -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT
PC
cat > "$C/lib/pkgconfig/libpcre2-8.pc" <<'PC'
prefix=${pcfiledir}/../..
Name: libpcre2-8
Description: Debian's PCRE2 10.42 (8-bit), carried to the GPU machine
Version: 10.42
Libs: -L${prefix}/lib -lpcre2-8
Cflags: -I${prefix}/include
PC
echo "carry_headers: .carry: $(du -sh "$C" | cut -f1); include: $(ls "$C/include" | tr '\n' ' '); lib: $(ls "$C/lib" | tr '\n' ' ')"
