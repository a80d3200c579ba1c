"""Screenshots of TensorBoard showing a training run, for the docs (docs/figures/tensorboard-*.png).

    python scripts/tensorboard_screenshots.py                      # trains configs/default.yaml first
    python scripts/tensorboard_screenshots.py --logdir lightning_logs/default --out /tmp/shots

Starts TensorBoard on 127.0.0.1 (a free port) over ``--logdir`` (by default it first runs
``scripts/train.py fit --config configs/default.yaml`` into a temporary folder: the run a newcomer's
``make train`` makes, whose printed summary then goes into docs/tensorboard.md's ``train-summary``
section, committed as docs/results/train-summary.txt), opens it in headless Chromium through
Playwright, and writes:

- ``tensorboard-accuracy.png``: Time Series, the accuracy tags and the stream's drift, every
  memory on one chart in its own colour (smoothing off, outliers not ignored);
- ``tensorboard-custom-scalars.png``: the Custom Scalars layout, one chart per compared metric;
- ``tensorboard-attention.png``: one category's criterion attention and relevance images, as
  TensorBoard shows them at its default image size.

Needs Chromium (Debian's ``chromium`` package: ``/usr/bin/chromium``, or ``--chromium PATH``) and
the ``playwright`` Python package (the ``docs`` extra); it never downloads a browser.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training.cli import ArgumentParser  # noqa: E402
from training.readme import markers, replace_section  # noqa: E402

# Chromium on a machine without a network or a screen: no GPU, no background connections
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# TensorBoard's own settings (its localStorage), as a reader would set them to compare the runs
SETTINGS = {"scalarSmoothing": 0, "ignoreOutliers": False, "timeSeriesSettingsPaneOpened": False}
VIEWPORT = {"width": 1400, "height": 1000}


SUMMARY = "train-summary"  # the generated section of docs/tensorboard.md: the run's own summary
SUMMARY_START = re.compile(r"^[0-9][0-9,]* decisions")


def train_default(folder: Path) -> tuple[Path, str]:
    """Run ``configs/default.yaml`` into ``folder``; returns the logger's folder (``tensorboard --logdir``)
    and the summary the run printed (each memory's accuracy, where the logs are)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "fit", "--config",
                           str(ROOT / "configs" / "default.yaml"), f"--trainer.default_root_dir={folder}",
                           "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"],
                          capture_output=True, text=True)
    if done.returncode != 0:  # say why, not only that it failed
        raise SystemExit(f"training configs/default.yaml failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if SUMMARY_START.match(line))
    summary = "\n".join(lines[first:]).replace(f"{folder}{os.sep}", "")  # as a run in the checkout prints it
    return folder / "lightning_logs" / "default", summary.strip() + "\n"


def publish_summary(summary: str, doc: Path) -> None:
    """Commit the run's ``summary`` as docs/results/train-summary.txt and show it in ``doc``'s section."""
    (doc.parent / "results" / f"{SUMMARY}.txt").write_text(summary)
    if not replace_section(doc, *markers(SUMMARY), f"```text\n{summary.rstrip()}\n```"):
        raise SystemExit(f"{doc} has no {SUMMARY} section markers")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_tensorboard(logdir: Path, port: int, timeout: float = 60.0) -> subprocess.Popen:
    """TensorBoard on 127.0.0.1:``port``, returned once it answers (and has read the runs)."""
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
                               "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"tensorboard exited with {server.returncode}: {server.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=2) as answer:
                if json.loads(answer.read()):
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"tensorboard did not answer on 127.0.0.1:{port} within {timeout:.0f} s")


def screenshots(url: str, out: Path, chromium: str, category: str) -> list[Path]:
    """Open each view of TensorBoard at ``url`` and save it under ``out``; returns the files."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.add_init_script(f"localStorage.setItem('_tb_global_settings', {json.dumps(json.dumps(SETTINGS))});")

        def time_series(tags: str, name: str, height: int) -> None:
            page.set_viewport_size({"width": VIEWPORT["width"], "height": height})  # the cards, no empty page below
            page.goto(f"{url}/#timeseries")
            page.wait_for_selector("input[placeholder='Filter tags (regex)']")
            page.fill("input[placeholder='Filter tags (regex)']", tags)
            page.keyboard.press("Escape")  # close the tag suggestions over the cards
            page.wait_for_timeout(4000)  # the cards fetch and draw their series
            written.append(out / name)
            page.screenshot(path=str(written[-1]))

        time_series("^acc/|^stream/", "tensorboard-accuracy.png", 600)
        time_series(f"^(attention|relevance)_chart/{re.escape(category)}$", "tensorboard-attention.png", 520)
        page.set_viewport_size(VIEWPORT)
        page.goto(f"{url}/#custom_scalars")
        page.wait_for_timeout(3000)
        outliers = page.get_by_text("Ignore outliers in chart scaling")
        if outliers.count():  # the Custom Scalars tab keeps its own settings: outliers ignored, smoothing 0.6
            outliers.first.click()
        smoothing = page.locator("tf-smoothing-input input[type=number], #smoothing input").first
        if smoothing.count():
            smoothing.fill("0")
            smoothing.press("Enter")
        page.mouse.wheel(0, -10000)  # back to the top: the runs' colours on the left, the first charts
        page.wait_for_timeout(3000)
        written.append(out / "tensorboard-custom-scalars.png")
        page.screenshot(path=str(written[-1]))
        browser.close()
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", type=Path, default=None,
                        help="a folder of runs (as for tensorboard --logdir); default: train configs/default.yaml "
                             "first")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures", help="where the PNG files go")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                        help="the Chromium executable (Debian's chromium package)")
    parser.add_argument("--category", default="invoice", help="the category whose attention is shown")
    args = parser.parse_args(argv)
    if not Path(args.chromium).is_file():
        parser.error(f"--chromium {args.chromium}: no such file; install Debian's chromium or give its path")
    if args.logdir is not None and not args.logdir.is_dir():
        parser.error(f"--logdir {args.logdir}: no such folder")
    with tempfile.TemporaryDirectory() as scratch:
        if args.logdir is None:  # the newcomer's run: its summary goes into docs/tensorboard.md beside the shots
            logdir, summary = train_default(Path(scratch))
            print(summary)
            if args.out.resolve() == (ROOT / "docs" / "figures").resolve():
                publish_summary(summary, ROOT / "docs" / "tensorboard.md")
        else:
            logdir = args.logdir
        port = free_port()
        server = start_tensorboard(logdir, port)
        try:
            written = screenshots(f"http://127.0.0.1:{port}", args.out, args.chromium, args.category)
        finally:
            server.terminate()
            server.wait(timeout=30)
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
