#!/usr/bin/env bash
# Packs what a device call left in an output folder into DIR/others.tar.gz, except the files named: the device tool
# brings back at most 8 files from $OUT (its README), so a run that writes more keeps its main files readable and
# the rest in one archive (`tar xzf others.tar.gz` here). Nothing to do when the folder holds 8 files or fewer.
#
#   bash bench/bundle_out.sh DIR [KEEP ...]
set -uo pipefail
dir="$1"; shift
[[ -d "$dir" ]] || { echo "bundle_out: no folder $dir" >&2; exit 2; }
mapfile -t all < <(cd "$dir" && find . -mindepth 1 -maxdepth 1 ! -name others.tar.gz -printf '%P\n' | sort)
((${#all[@]} <= 8)) && exit 0
pack=()
for f in "${all[@]}"; do
  keep=0
  for k in "$@"; do [[ "$f" == "$k" ]] && keep=1; done
  ((keep)) || pack+=("$f")
done
((${#pack[@]})) || exit 0
tar czf "$dir/others.tar.gz" -C "$dir" --remove-files "${pack[@]}" \
  && echo "bundle_out: ${#pack[@]} files of $dir in others.tar.gz (kept: $*)"
