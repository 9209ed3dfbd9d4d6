"""A real headless Chromium (Debian's ``chromium`` package), driven over the DevTools protocol
with aiohttp's WebSocket client: what the dashboard test loads its page in."""

from __future__ import annotations

import asyncio
import base64
import itertools
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import msgspec

__all__ = ["CHROMIUM", "Browser"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# As this machine's notes advise: no sandbox (root), and none of Chromium's own traffic, which
# the closed network would refuse.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
)


class Browser:
    """One Chromium process with one page; ``async with Browser(tmp) as b``."""

    def __init__(self, tmp: Path, width: int = 1400, height: int = 900) -> None:
        assert CHROMIUM is not None
        self.chromium: str = CHROMIUM
        self.profile = tmp / "chromium-profile"
        self.width, self.height = width, height
        self.proc: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Browser:
        await asyncio.to_thread(self.profile.mkdir)
        self.proc = await asyncio.create_subprocess_exec(
            self.chromium,
            *_FLAGS,
            f"--user-data-dir={self.profile}",
            "about:blank",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while (port := _devtools_port(self.profile)) is None:
            assert self.proc.returncode is None, f"chromium exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "chromium never opened its DevTools port"
            await asyncio.sleep(0.05)
        self.http = aiohttp.ClientSession()
        async with self.http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events on the way are skipped)."""
        assert self.ws is not None
        msg_id = next(self._ids)
        await self.ws.send_str(
            msgspec.json.encode({"id": msg_id, "method": method, "params": params}).decode()
        )
        while True:
            frame = await self.ws.receive(timeout=30)
            assert frame.type == aiohttp.WSMsgType.TEXT, f"DevTools closed: {frame}"
            msg = msgspec.json.decode(frame.data)
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg["result"]
                return result

    async def goto(self, url: str) -> None:
        """Open ``url`` and wait until it has loaded."""
        await self.send("Page.navigate", url=url)
        await self.wait_for(
            f"location.href === {msgspec.json.encode(url).decode()} "
            "&& document.readyState === 'complete'"
        )

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        out = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """The value of ``expression`` once it is truthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"never true in the page: {expression}"
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))


def _devtools_port(profile: Path) -> int | None:
    """The port Chromium chose, which it writes into its profile once it listens."""
    try:
        lines = (profile / "DevToolsActivePort").read_text().splitlines()
    except FileNotFoundError:
        return None
    return int(lines[0]) if len(lines) >= 2 else None
