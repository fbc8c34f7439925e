#!/usr/bin/env bash
# Checks that the C++ sources are as clang-format 14 (Debian's, installed by
# scripts/setup.sh) writes them with the project's .clang-format. Exits 1 and names
# each file and line that differs; `scripts/check-format.sh --fix` rewrites them.
# With file arguments it checks those files (tests/layers/check_format_test.sh uses
# this); without, every *.cc and *.h git tracks or would add (a new file too). Run
# by ctest as the test CheckFormat.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

fix=0
if [[ "${1:-}" == --fix ]]; then
  fix=1
  shift
fi

if ! command -v clang-format >/dev/null 2>&1; then
  echo "check-format: clang-format is missing; scripts/setup.sh installs it" >&2
  exit 1
fi
# Another major version formats some constructs differently: its verdict would be noise.
version="$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')"
if [[ "$version" != 14 ]]; then
  echo "check-format: clang-format $version found; the sources are formatted by version 14" \
       "(Debian 12's clang-format), whose output alone this check compares" >&2
  exit 1
fi

files=()
if (($#)); then
  files=("$@")
else
  cd "$root"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    list=(git ls-files --cached --others --exclude-standard '*.cc' '*.h')  # new files too
  else  # an unpacked source tree without .git
    list=(find apps src include tests bench examples -name '*.cc' -o -name '*.h')
  fi
  while IFS= read -r f; do files+=("$f"); done < <("${list[@]}" 2>/dev/null)
fi
((${#files[@]})) || exit 0

style="--style=file:$root/.clang-format"
if ((fix)); then
  printf '%s\0' "${files[@]}" | xargs -0 -P2 -n 40 clang-format "$style" -i
  exit 0
fi
out="$(printf '%s\0' "${files[@]}" |
       xargs -0 -P2 -n 40 clang-format "$style" --dry-run --Werror --ferror-limit=3 2>&1)" || true
if [[ -n "$out" ]]; then
  # clang-format prints each place (file:line:col: error: ...) and the line; keep the places.
  grep ': error: ' <<<"$out" | sed 's/: error: .*//' | sort -u | sed 's/^/check-format: not formatted: /' >&2
  echo "check-format: run scripts/check-format.sh --fix (clang-format 14, .clang-format)" >&2
  exit 1
fi
