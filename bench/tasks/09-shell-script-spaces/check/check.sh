#!/usr/bin/env bash
# Hidden check: backup.sh handles spaces in both paths and still handles the plain and error cases.
set -u
script="$PWD/scripts/backup.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$scratch/home/My Documents/sub dir" "$scratch/plain"
echo "tax return" > "$scratch/home/My Documents/sub dir/2024 return.txt"
echo "notes" > "$scratch/plain/notes.txt"

cd "$scratch/home" || fail "cannot enter scratch"
bash "$script" "My Documents" "back ups" || fail "backup of 'My Documents' exited non-zero"
archive="back ups/My Documents-backup.tar.gz"
[ -f "$archive" ] || fail "expected archive '$archive'"
tar -tzf "$archive" | grep -qx "My Documents/sub dir/2024 return.txt" || fail "archive lacks the file"

bash "$script" "$scratch/plain" "$scratch/out" || fail "backup of a plain path exited non-zero"
tar -tzf "$scratch/out/plain-backup.tar.gz" | grep -qx "plain/notes.txt" || fail "plain archive lacks notes.txt"

if bash "$script" "no such dir" "$scratch/out" 2>/dev/null; then fail "a missing source must fail"; fi
if bash "$script" "only-one-arg" 2>/dev/null; then fail "one argument must fail"; fi
[ ! -e "$scratch/out/no such dir-backup.tar.gz" ] || fail "archive written for a missing source"
echo "ok"
