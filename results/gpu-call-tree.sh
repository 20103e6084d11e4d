#!/usr/bin/env bash
# What a call to a lent GPU carries: the device tool sends the working tree
# (tracked and untracked-not-ignored files) and refuses one over 64 MiB. The
# repository alone is ~43 MB (test fixtures, the results' metrics) and the
# GPU bundle (.gpu/terse-gpu-bundle.tar.xz) adds 30-40 MB, so together they
# are over it. The prepared calls read only scripts, configs and the bundle:
#
#   bash results/gpu-call-tree.sh slim     # moves the large files no call
#                                          # reads into .offload/ (ignored by
#                                          # .git/info/exclude), prints the size
#   ... the device call ...
#   bash results/gpu-call-tree.sh restore  # moves them back: git status as before
#   bash results/gpu-call-tree.sh size     # what would travel now, against 64 MiB
#
# "Large" is 256 KiB or more, under crates/*/tests/fixtures/ and results/
# except results/gpu-*/ (the calls' own scripts and records).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
limit=$((64 * 1024 * 1024))

# Bytes that would travel: a tracked file moved away is still listed by git
# but has nothing to stat, and does not travel.
travelling() {
    git ls-files -z -c -o --exclude-standard |
        { xargs -0 stat -c %s 2> /dev/null || true; } | awk '{ s += $1 } END { print s + 0 }'
}

size() {
    local bytes
    bytes=$(travelling)
    awk -v b="$bytes" -v l="$limit" 'BEGIN { printf "travels: %.1f MB of %.1f MB allowed\n", b / 1e6, l / 1e6 }'
    ((bytes <= limit)) || { echo "over the device tool's limit: the call would be refused" >&2; return 1; }
}

slim() {
    grep -qx '/.offload/' .git/info/exclude 2> /dev/null || echo '/.offload/' >> .git/info/exclude
    local moved=0 f bytes
    while IFS= read -r -d '' f; do
        [[ $f == results/gpu-* || ! -f $f ]] && continue
        bytes=$(stat -c %s "$f")
        ((bytes >= 262144)) || continue
        mkdir -p ".offload/$(dirname "$f")"
        mv "$f" ".offload/$f"
        moved=$((moved + 1))
    done < <(git ls-files -z -- 'crates/*/tests/fixtures/*' 'results/*')
    echo "moved $moved files into .offload/ (restore: bash $0 restore)"
    size
}

restore() {
    [[ -d .offload ]] || { echo "nothing to restore (.offload/ absent)"; return 0; }
    local f
    while IFS= read -r -d '' f; do
        f=${f#./}
        mkdir -p "$(dirname "$f")"
        mv ".offload/$f" "$f"
    done < <(cd .offload && find . -type f -print0)
    rm -rf .offload
    if git status --porcelain | grep -q '^ D'; then
        echo "still missing after restore:" >&2
        git status --porcelain | grep '^ D' >&2
        return 1
    fi
    echo "restored"
}

case ${1:-size} in
    slim) slim ;;
    restore) restore ;;
    size) size ;;
    *) echo "usage: $0 slim|restore|size" >&2; exit 2 ;;
esac
