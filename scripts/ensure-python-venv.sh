#!/usr/bin/env bash
# Make sure target/venv holds the Python packages of integration/python/requirements.txt (the
# official MCP client the MCP end-to-end tests drive) and print the venv's python. With a name
# (`e2b-2.63.0`), the venv is target/venv-NAME from integration/python/NAME.txt (E2B's SDK, one
# venv per pinned version the E2B tests drive). Installs
# python3-venv with apt-get when the interpreter cannot make a venv; packages come from PyPI
# only. A venv whose recorded requirements match the file, and whose python still finds the
# SDK installed, is left as it is. Concurrent runs (test processes side by side) wait for each
# other.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"

root=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
name=${1:-}
if [ -n "$name" ]; then
    case "$name" in *[!A-Za-z0-9._-]*) echo "bad venv name: $name" >&2; exit 2 ;; esac
    req="$root/integration/python/$name.txt"
    venv="$root/target/venv-$name"
else
    req="$root/integration/python/requirements.txt"
    venv="${DAIV_PYTHON_VENV:-$root/target/venv}"
fi
# The package whose presence says the install finished: the first pinned one.
package=$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' "$req" | head -n 1)
stamp="$venv/.requirements"

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

command -v python3 >/dev/null 2>&1 || apt_ensure python3
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    apt_ensure python3-venv
fi
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp" &&
    "$venv/bin/python" -c 'import importlib.metadata as m; m.version("'"$package"'")' >/dev/null 2>&1; then
    echo "$venv/bin/python"
    exit 0
fi
rm -rf "$venv"
run_quiet "python3 -m venv $venv" python3 -m venv "$venv"
run_quiet "pip install -r $req" "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -r "$req"
cp "$req" "$stamp"
echo "$venv/bin/python"
