#!/usr/bin/env bash
# Usage: backup.sh SOURCE_DIR DEST_DIR
# Writes DEST_DIR/<name of SOURCE_DIR>-backup.tar.gz holding SOURCE_DIR and everything in it.
set -eu

if [ $# -ne 2 ]; then
    echo "usage: backup.sh SOURCE_DIR DEST_DIR" >&2
    exit 2
fi

src=$1
dest=$2

if [ ! -d "$src" ]; then
    echo "backup.sh: $src is not a directory" >&2
    exit 1
fi

name=$(basename "$src")
parent=$(dirname "$src")
archive=$dest/$name-backup.tar.gz

mkdir -p "$dest"
tar -czf "$archive" -C "$parent" "$name"
echo "wrote $archive"
