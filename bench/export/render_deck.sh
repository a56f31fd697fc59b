#!/usr/bin/env bash
# Render a deck to one PNG per slide, to look at it: PPTX -> PDF (LibreOffice) -> PNG (poppler).
# Usage: bench/export/render_deck.sh DECK.pptx [OUT_DIR] [DPI]
# Needs: apt-get install -y libreoffice-impress poppler-utils  (fonts-crosextra-carlito for
# Calibri's metrics). Writes OUT_DIR/<deck>.pdf and OUT_DIR/<deck>-<n>.png; prints the PNGs.
set -euo pipefail
deck=${1:?usage: render_deck.sh DECK.pptx [OUT_DIR] [DPI]}
out=${2:-$(dirname "$deck")/render}
dpi=${3:-80}
for tool in soffice pdftoppm; do
  command -v "$tool" >/dev/null || { echo "render_deck.sh: $tool not found (apt-get install -y libreoffice-impress poppler-utils)" >&2; exit 3; }
done
mkdir -p "$out"
name=$(basename "${deck%.*}")
# A private profile, so a running LibreOffice or a read-only home does not block the conversion.
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
soffice -env:UserInstallation=file://"$profile" --headless --convert-to pdf --outdir "$out" "$deck" >/dev/null
rm -f "$out/$name"-*.png
pdftoppm -png -r "$dpi" "$out/$name.pdf" "$out/$name"
ls "$out/$name"-*.png
