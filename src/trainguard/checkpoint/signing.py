"""Who may write a checkpoint: HMAC-signed manifests and the keyring that signs and checks them
(stdlib only: the supervisor verifies without torch).

A checkpoint folder is code that the next resume runs (torch's loaders unpickle), so a resume
loads only what a manifest signed with one of the user's keys lists, and only with the loader
the signed manifest names. The manifest's ``signature`` is HMAC-SHA256 over the canonical JSON of
every other field, and every file entry carries its SHA-256: CRC-32 keeps finding torn and
bit-flipped files, SHA-256 under the HMAC finds rewritten ones.

Where the keys come from (first match; never the command line)::

    TRAINGUARD_CHECKPOINT_KEY        the keyring itself, for secrets handed over as environment
    TRAINGUARD_CHECKPOINT_KEY_FILE   a keyring file (a multi-node job: one every node can read)
    $XDG_CONFIG_HOME/trainguard/checkpoint.key   (~/.config/...) the per-user default

A keyring is one key per line (64 hex digits, ``#`` comments); the first line signs, every line
verifies. Rotation: put a new key on the first line, keep the old lines until no checkpoint they
signed is needed, then delete them (``trainguard checkpoints key rotate`` does the first part).
A key file that is missing is created (0600, one fresh key) by the first save, never by a read;
one readable by group or others is refused. ``TRAINGUARD_CHECKPOINT_ALLOW_UNSIGNED=1`` accepts
unsigned checkpoints (those written before signing existed).

    >>> ring = Keyring.generate()
    >>> mac = ring.signing.mac(b"canonical manifest")
    >>> ring.check(ring.signing.id, b"canonical manifest", mac)
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import ConfigError

ALGORITHM = "hmac-sha256"
KEY_ENV = "TRAINGUARD_CHECKPOINT_KEY"
KEY_FILE_ENV = "TRAINGUARD_CHECKPOINT_KEY_FILE"
ALLOW_UNSIGNED_ENV = "TRAINGUARD_CHECKPOINT_ALLOW_UNSIGNED"
ENCRYPT_ENV = "TRAINGUARD_CHECKPOINT_ENCRYPT"
KEY_BYTES = 32
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class Key:
    """One secret; its id (a one-way fingerprint) is what a manifest names."""

    secret: bytes

    @property
    def id(self) -> str:
        return hashlib.sha256(b"trainguard checkpoint key id\0" + self.secret).hexdigest()[:16]

    def mac(self, data: bytes) -> str:
        return hmac.new(self.secret, data, hashlib.sha256).hexdigest()

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"Key(id={self.id!r})"


@dataclass(frozen=True, slots=True)
class Keyring:
    """The accepted keys, the signing key first; ``source`` says where they came from."""

    keys: tuple[Key, ...]
    source: str = "(in memory)"

    @property
    def signing(self) -> Key:
        if not self.keys:
            raise ConfigError(f"no checkpoint signing key in {self.source}")
        return self.keys[0]

    def find(self, key_id: str) -> Key | None:
        return next((k for k in self.keys if k.id == key_id), None)

    def check(self, key_id: str, data: bytes, mac: str) -> bool:
        key = self.find(key_id)
        return key is not None and hmac.compare_digest(key.mac(data), mac)

    @classmethod
    def generate(cls) -> Keyring:
        return cls((Key(secrets.token_bytes(KEY_BYTES)),))

    @classmethod
    def parse(cls, text: str, source: str) -> Keyring:
        keys = []
        for number, line in enumerate(text.splitlines(), 1):
            word = line.split("#", 1)[0].strip()
            if not word:
                continue
            try:
                secret = bytes.fromhex(word)
            except ValueError:
                secret = b""
            if len(secret) < KEY_BYTES:
                raise ConfigError(
                    f"{source} line {number}: a key is {2 * KEY_BYTES} or more hex digits "
                    "(make one with: trainguard checkpoints key rotate)"
                )
            keys.append(Key(secret))
        return cls(tuple(keys), source)


@dataclass(frozen=True, slots=True)
class Trust:
    """What a reader accepts: manifests signed by ``keyring``, and unsigned ones if allowed."""

    keyring: Keyring
    allow_unsigned: bool = False


def default_key_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "trainguard" / "checkpoint.key"


def key_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env[KEY_FILE_ENV]) if env.get(KEY_FILE_ENV) else default_key_path(env)


def load_keyring(environ: Mapping[str, str] | None = None, create: bool = False) -> Keyring:
    """The keyring the environment names (see the module docstring). ``create``: a missing key
    file is made with one fresh key (a save); else a missing one is an empty keyring (a read)."""
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        return Keyring.parse(env[KEY_ENV], f"${KEY_ENV}")
    path = key_path(env)
    if create:
        _create_key_file(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Keyring((), str(path))
    except OSError as exc:
        raise ConfigError(f"cannot read checkpoint key file {path}: {exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"checkpoint key file {path} is readable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}"
        )
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read checkpoint key file {path}: {exc}") from None
    return Keyring.parse(text, str(path))


def trust_from_env(environ: Mapping[str, str] | None = None) -> Trust:
    return Trust(load_keyring(environ), allow_unsigned_from_env(environ))


def allow_unsigned_from_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ALLOW_UNSIGNED_ENV, "").strip().lower() in _TRUE


def encrypt_from_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENCRYPT_ENV, "").strip().lower() in _TRUE


def _create_key_file(path: Path) -> None:
    """One fresh key at ``path``, 0600, unless a key file is there already. Savers on several
    nodes may race on a shared filesystem: the key goes in under a private name and is linked
    into place (link fails if the name exists), so every saver ends up with the winner's key."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        body = secrets.token_hex(KEY_BYTES) + "  # trainguard checkpoint key: the first signs, all verify\n"
        os.write(fd, body.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def rotate(path: Path) -> Key:
    """Put a fresh key on the first line of the key file at ``path`` (created if missing); the
    old keys stay, to verify what they signed. Returns the new key."""
    key = Key(secrets.token_bytes(KEY_BYTES))
    old = ""
    if path.exists():
        load_keyring({KEY_FILE_ENV: str(path)})  # refuses a key file that is not private or not valid
        old = path.read_text(encoding="ascii")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, f"{key.secret.hex()}\n{old}".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return key
