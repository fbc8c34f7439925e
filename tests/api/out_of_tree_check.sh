#!/usr/bin/env bash
# The installed package as a user meets it: `cmake --install` into a fresh prefix,
# then examples/embedded built OUTSIDE the tree with find_package(waystone), and a
# program built with pkg-config alone; both run against the independent ERP target
# (tests/targets/erp_target.py), whose own counts are checked. Also: the shared
# library exports the public API's symbols and nothing of the engine inside.
# Usage: out_of_tree_check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
tmp=$(mktemp -d)
target_pid=""
cleanup() {
  [[ -n "$target_pid" ]] && kill "$target_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "out-of-tree: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" ||
  fail "cmake --install failed: $(cat "$tmp/install.log")"
lib=$(find "$tmp/prefix" -name 'libwaystone.so' | head -1)
[[ -n "$lib" ]] || fail "no libwaystone.so installed"
libdir=$(dirname "$lib")
for header in waystone.h engine.h status.h export.h version.h workflow.h json_codec.h; do
  [[ -f "$tmp/prefix/include/waystone/$header" ]] || fail "header $header not installed"
  # Each compiles on its own, as C++17, with nothing but the installed headers.
  echo "#include <waystone/$header>" |
    c++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I"$tmp/prefix/include" -x c++ - \
      2> "$tmp/header.log" || fail "<waystone/$header> does not compile alone: $(cat "$tmp/header.log")"
done
[[ -x "$tmp/prefix/bin/waystone" ]] || fail "the waystone command is not installed"

# Exported: waystone::api's functions, vtables and typeinfo; nothing else of ours.
# (The standard library's own headers give some of its templates default
# visibility, e.g. shared_ptr's typeinfo: those are std's, shared by design, as
# long as none is instantiated over a type of ours other than the API's.)
nm -D --defined-only -C "$lib" | cut -d' ' -f3- > "$tmp/exported"
leaked=$( (grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' "$tmp/exported" |
           grep -v -E '^((vtable|typeinfo|typeinfo name) for )?(waystone::api::|std::)'
           grep -E 'waystone::' "$tmp/exported" | grep -v -E 'waystone::api::') || true)
[[ -z "$leaked" ]] || fail "libwaystone.so exports more than the API:
$(echo "$leaked" | head -20)"
grep -q 'waystone::api::Engine::Open' "$tmp/exported" ||
  fail "libwaystone.so does not export waystone::api::Engine::Open"

# The independent ERP target.
# (timeout: should this script be killed outright, the target does not outlive it long)
timeout 600 python3 "$source/tests/targets/erp_target.py" --port 0 > "$tmp/target.out" 2> "$tmp/target.err" &
target_pid=$!
for _ in $(seq 1 100); do
  grep -q '^PORT ' "$tmp/target.out" 2>/dev/null && break
  sleep 0.1
done
port=$(sed -n 's/^PORT //p' "$tmp/target.out")
[[ -n "$port" ]] || fail "the ERP target did not start: $(cat "$tmp/target.err")"
export ERP_URL="http://127.0.0.1:$port"
stat() {  # stat FIELD: what the target counted
  python3 -c "import json,sys,urllib.request
print(json.load(urllib.request.urlopen('$ERP_URL/_target/stats'))[sys.argv[1]])" "$1"
}

# 1. CMake: find_package(waystone) from the prefix, built outside the tree.
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$source/examples/embedded" -B "$tmp/example" "${generator[@]}" \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log" 2>&1 ||
  fail "configuring examples/embedded failed: $(cat "$tmp/configure.log")"
cmake --build "$tmp/example" > "$tmp/build.log" 2>&1 ||
  fail "building examples/embedded failed: $(cat "$tmp/build.log")"
db="$tmp/orders.db"
out=$("$tmp/example/order-example" "$db" "$source/examples/embedded/order.yaml" K-1 \
      '{"order_id":"K-1","amount":5}') || fail "order-example failed: $out"
echo "$out"
grep -q 'K-1 started completed' <<< "$out" || fail "K-1 did not complete: $out"
grep -q 'create-order .* completed .*ORD-1' <<< "$out" || fail "no ORD-1 recorded: $out"
# Again: the same business action is the instance already there; nothing is sent.
out=$("$tmp/example/order-example" "$db" "$source/examples/embedded/order.yaml" K-1 \
      '{"order_id":"K-1","amount":5}') || fail "order-example failed again: $out"
grep -q 'K-1 found completed' <<< "$out" || fail "K-1 was not found completed: $out"
[[ "$(stat orders)" == 1 ]] || fail "the ERP has $(stat orders) orders after K-1 twice, not 1"
[[ "$(stat messages)" == 1 ]] || fail "the target has $(stat messages) messages, not 1"
# A workflow written as a C++ function (examples/embedded/order_saga.cc), built out of
# the tree too: its order, its row in the program's own table, its message.
saga_db="$tmp/saga.db"
python3 -c "import sqlite3, sys
sqlite3.connect(sys.argv[1]).execute('CREATE TABLE orders (id INTEGER PRIMARY KEY, order_key TEXT UNIQUE NOT NULL, erp_id TEXT NOT NULL, amount NUMERIC, state TEXT NOT NULL DEFAULT \\'open\\')')" "$saga_db"
out=$("$tmp/example/order-saga" "$saga_db" "$ERP_URL" S-1 5 U-1) || fail "order-saga failed: $out"
grep -q 'state completed' <<< "$out" || fail "S-1 did not complete: $out"
grep -q 'erp ORD-2 row 1' <<< "$out" || fail "S-1 did not record ORD-2 in row 1: $out"
[[ "$(stat orders)" == 2 ]] || fail "the ERP has $(stat orders) orders after S-1, not 2"
[[ "$(stat messages)" == 2 ]] || fail "the target has $(stat messages) messages after S-1, not 2"

# 2. pkg-config alone, with the C++ compiler.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs waystone) || fail "pkg-config does not know waystone"
c++ -o "$tmp/pc-example" "$source/examples/embedded/main.cc" $flags -Wl,-rpath,"$libdir" \
    2> "$tmp/pc.log" || fail "building with pkg-config failed: $(cat "$tmp/pc.log")"
out=$("$tmp/pc-example" "$db" "$source/examples/embedded/order.yaml" K-2 \
      '{"order_id":"K-2","amount":7}') || fail "the pkg-config build failed: $out"
grep -q 'K-2 started completed' <<< "$out" || fail "K-2 did not complete: $out"
[[ "$(stat orders)" == 3 ]] || fail "the ERP has $(stat orders) orders, not 3"
[[ "$(stat messages)" == 3 ]] || fail "the target has $(stat messages) messages, not 3"
# A bad definition: a clear error naming the file, and exit 1.
printf 'workflow: bad\nkey: "{{input.id}}"\nsteps:\n  - name: s\n    request: { method: GET }\n' \
  > "$tmp/bad.yaml"
if out=$("$tmp/pc-example" "$db" "$tmp/bad.yaml" X '{"id":"X"}' 2>&1); then
  fail "a bad definition was accepted: $out"
fi
grep -q 'bad.yaml' <<< "$out" || fail "the error does not name the file: $out"
echo "out-of-tree: find_package and pkg-config builds ran; the ERP counted 3 orders, 3 messages"
