"""The report opened in a real browser: headless Chromium, from disk, with the network off."""

import re
import shutil
import subprocess

import pytest

from tests import tiny_models as tm
from tl_geometry import run_with_geometry_hooks
from tl_geometry.report.html import FIGURES, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# No network: every host resolves to nothing and any proxy use goes to a closed local port.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000",
)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs it where apt-get is root)")


def test_every_figure_renders_offline_without_console_messages(tmp_path):
    model = tm.make_model("bridge-llama")
    result = run_with_geometry_hooks(
        model, tm.with_bos(tm.random_tokens(2, 20)), n_grid=[1, 2, 4, 21], diagnostics="all"
    )
    index = write_report(result, tmp_path / "report")
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", index.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    starts = {f.key: dom.find(f'id="{f.key}" class="plotly-graph-div') for f in FIGURES}
    assert all(at >= 0 for at in starts.values()), starts
    bounds = sorted(starts.values()) + [len(dom)]
    for key, at in starts.items():
        body = dom[at : bounds[bounds.index(at) + 1]]
        assert 'class="main-svg"' in body, f"figure {key} did not render an SVG"
    console = [line for line in done.stderr.splitlines() if re.search(r":CONSOLE[:(]", line)]
    assert console == [], console
