#!/usr/bin/env bash
# Installs the event file reader's packages (tfrecord, a TFRecord reader that
# checks both CRCs, and protobufjs, the versions package.json pins) into
# DIR/node_modules, once. tfrecord's CRC-32C comes from fast-crc32c, which
# uses the optional native sse4_crc32 when it builds and plain JavaScript when
# it does not. Tests running side by side call this at the same time, so the
# check and the install happen under one lock on DIR.lock: the first caller
# installs, the others wait and find it done.
#   bash tests/tensorboard/install.sh DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:?usage: install.sh DIR}"
pinned() { sed -n "s/.*\"$1\": \"\(.*\)\".*/\1/p" "$here/package.json"; }
have() { sed -n 's/^  "version": "\(.*\)",$/\1/p' "$dir/node_modules/$1/package.json" 2>/dev/null || true; }
installed() {
  [ -f "$dir/.installed" ] && [ "$(have tfrecord)" = "$(pinned tfrecord)" ] &&
    [ "$(have protobufjs)" = "$(pinned protobufjs)" ]
}
installed && exit 0
command -v npm >/dev/null || { echo "install.sh: npm is missing (scripts/setup.sh installs it)" >&2; exit 1; }
command -v flock >/dev/null || { echo "install.sh: flock is missing (util-linux)" >&2; exit 1; }
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
installed && exit 0
rm -f "$dir/.installed"
cp "$here/package.json" "$dir/package.json"
cd "$dir"
npm install --no-audit --no-fund --loglevel=error >&2
touch .installed
