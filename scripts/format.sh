#!/usr/bin/env bash
# scripts/format.sh: formats every tracked C++/CUDA source of k3serve (src/, tests/, bench/, eval/:
# .h .hpp .cc .cpp .cu .cuh) in place with clang-format 14 and the repository's .clang-format.
#
#   bash scripts/format.sh           format in place
#   bash scripts/format.sh --check   change nothing; list the files that are not formatted and exit 1
#
# The style is pinned to clang-format 14 (Debian 12's clang-format package): another major
# version formats some constructs differently, so it is used only with a warning.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "scripts/format.sh: unknown argument '$1' (use --check, or no argument)" >&2; exit 2 ;;
esac

clang_format=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null 2>&1; then clang_format="$c"; break; fi
done
if [ -z "$clang_format" ]; then
  echo "scripts/format.sh: neither clang-format-14 nor clang-format is on the PATH." >&2
  echo "  install it with: sudo apt-get install clang-format   (Debian 12; it installs clang-format-14)" >&2
  echo "  or run scripts/install_deps.sh, which lists it" >&2
  exit 2
fi
version=$("$clang_format" --version | sed -n 's/.*version \([0-9][0-9]*\).*/\1/p')
if [ "$version" != "14" ]; then
  echo "scripts/format.sh: warning: $clang_format is version ${version:-unknown}, the style is pinned to 14;" \
       "its output may differ (install clang-format-14)" >&2
fi

# Tracked files only (never build/ or untracked files), and only those present in the work tree.
files=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] && files+=("$f")
done < <(git ls-files -z -- src tests bench eval | grep -zE '\.(h|hpp|cc|cpp|cu|cuh)$')
if ((${#files[@]} == 0)); then
  echo "scripts/format.sh: no sources found" >&2
  exit 2
fi

if ((check)); then
  # --dry-run --Werror reports "FILE:LINE:COL: error: code should be clang-formatted" (the first
  # one per file); anything else it prints (a bad .clang-format, a file it cannot read) is a failure.
  status=0
  out=$(printf '%s\0' "${files[@]}" |
    xargs -0 "$clang_format" --style=file --dry-run --Werror --ferror-limit=1 2>&1) || status=$?
  unformatted=$(printf '%s\n' "$out" |
    sed -n 's/^\(.*\):[0-9][0-9]*:[0-9][0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
  if [ -n "$unformatted" ]; then
    n=$(printf '%s\n' "$unformatted" | wc -l)
    echo "scripts/format.sh: $n of ${#files[@]} files are not formatted (run: bash scripts/format.sh):" >&2
    printf '%s\n' "$unformatted" | sed 's/^/  /' >&2
    exit 1
  fi
  if ((status != 0)); then
    printf '%s\n' "$out" >&2
    echo "scripts/format.sh: $clang_format failed (exit $status)" >&2
    exit 2
  fi
  echo "scripts/format.sh: all ${#files[@]} files are formatted"
else
  printf '%s\0' "${files[@]}" | xargs -0 "$clang_format" --style=file -i
  echo "scripts/format.sh: formatted ${#files[@]} files with $clang_format"
fi
