#!/usr/bin/env bash
# scripts/carry_headers.sh: copies the header-only dependencies the GPU machine lacks (xxhash.h,
# from Debian's libxxhash-dev here) into the git-ignored .carry/include, so a device run that
# carries ".carry" builds cache/, scheduler/ and engine/ and runs the engine on the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .carry/include
cp /usr/include/xxhash.h .carry/include/
echo "carry_headers: .carry/include: $(ls .carry/include | tr '\n' ' ')"
