"""A real S3-compatible server on 127.0.0.1, for tests of etcd backups to object storage (F-ETCD-7).

It runs versitygw, built by ``kustos dev build`` from ``gomod/versitygw`` like every other
dev binary, with its posix backend: each bucket is a directory under ``<data_dir>/buckets``,
so a test can also look at what a backup wrote. Nothing here needs an S3 client library:
buckets are created with versitygw's own admin command.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from kustos.devcluster.binaries import binary_path
from kustos.devcluster.ports import free_port

HOST = "127.0.0.1"
HEALTH_PATH = "/health"
# Variables versitygw reads for its options (see `versitygw --help`): inherited ones must not
# change the server we start.
_SERVER_ENV_PREFIXES = ("VGW_", "ROOT_", "ADMIN_")
_SERVER_ENV_NAMES = ("LOGFILE", "WEBHOOK")


@dataclass(frozen=True)
class S3ServerConfig:
    """What a test chooses; ``port=0`` takes a free port at each start."""

    data_dir: Path
    access_key: str = "kustos"
    secret_key: str = "kustos-secret-key"
    buckets: tuple[str, ...] = ()
    region: str = "us-east-1"
    port: int = 0
    host: str = HOST  # another 127.0.0.0/8 address when pods must reach it: to a pod, 127.0.0.1 is itself


class S3ServerError(RuntimeError):
    """The server could not be started or a bucket not created; the message says why."""


@dataclass
class S3Server:
    """One versitygw process that only ever listens on 127.0.0.1."""

    config: S3ServerConfig
    binary: Path = field(default_factory=lambda: binary_path("versitygw"))
    port: int = field(default=0, init=False)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def root(self) -> Path:
        """The posix backend's top directory: one subdirectory per bucket."""
        return self.config.data_dir / "buckets"

    @property
    def log_file(self) -> Path:
        return self.config.data_dir / "versitygw.log"

    def start(self, timeout: float = 30.0) -> None:
        """Start, wait until it answers, then create the configured buckets."""
        if self.process is not None and self.process.poll() is None:
            return
        if not self.binary.is_file():
            raise S3ServerError(f"{self.binary} is missing; build it with `kustos dev build`")
        self.root.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        # A port picked free can be taken before versitygw binds it: then it exits, and
        # another port is tried.
        attempts = 1 if self.config.port else 3
        for attempt in range(1, attempts + 1):
            self.port = self.config.port or free_port(self.config.host)
            if _answers(self.config.host, self.port):
                # Or its health check would pass while our process fails to bind.
                raise S3ServerError(f"something already answers on {self.endpoint}")
            self._spawn()
            failure = self._wait_healthy(deadline)
            if failure is None:
                break
            # Still running means the deadline passed: no time for another try.
            if self.process is not None or attempt == attempts:
                self.stop()
                raise S3ServerError(f"versitygw on {self.endpoint} {failure}:\n{self.log_tail()}")
        try:
            for bucket in self.config.buckets:
                self.create_bucket(bucket)
        except BaseException:
            self.stop()  # a half-started server would outlive the caller's cleanup
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM for a clean shutdown, SIGKILL if it does not come."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)

    def create_bucket(self, name: str) -> None:
        """Create a bucket owned by the configured account; one that exists already is fine."""
        env = self._environment()
        env["ADMIN_ACCESS_KEY_ID"] = self.config.access_key
        env["ADMIN_SECRET_ACCESS_KEY"] = self.config.secret_key
        env["ADMIN_REGION"] = self.config.region
        command = [str(self.binary), "admin", "--endpoint-url", self.endpoint, "create-bucket"]
        result = subprocess.run(
            [*command, "--owner", self.config.access_key, "--bucket", name],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        output = result.stdout + result.stderr
        if result.returncode != 0 and "BucketAlreadyOwnedByYou" not in output:
            raise S3ServerError(f"creating bucket {name} failed: {output.strip()}")

    def log_tail(self, lines: int = 25) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(_SERVER_ENV_PREFIXES) and k not in _SERVER_ENV_NAMES
        }
        # Credentials go by environment, not argv, so that `ps` does not show them.
        env["ROOT_ACCESS_KEY_ID"] = self.config.access_key
        env["ROOT_SECRET_ACCESS_KEY"] = self.config.secret_key
        return env

    def _spawn(self) -> None:
        command = [
            str(self.binary),
            "--port", f"{self.config.host}:{self.port}",
            "--region", self.config.region,
            "--health", HEALTH_PATH,
            "posix", str(self.root),
        ]  # fmt: skip
        with self.log_file.open("ab") as log:
            # Same process group as the caller: an interrupted test run takes it down too.
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._environment(),
            )

    def _wait_healthy(self, deadline: float) -> str | None:
        """None once the health endpoint answers 200, else what went wrong."""
        assert self.process is not None
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.process = None
                return f"exited with code {code}"
            if _answers(self.config.host, self.port):
                return None
            time.sleep(0.1)
        return "did not answer within the timeout"


def _answers(host: str, port: int) -> bool:
    # http.client, not httpx or urllib: they would send this through an HTTP(S)_PROXY from the
    # environment unless NO_PROXY lists 127.0.0.1.
    connection = http.client.HTTPConnection(host, port, timeout=1)
    try:
        connection.request("GET", HEALTH_PATH)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()
