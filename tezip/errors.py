"""Errors raised by tezip. Every failure a user can cause is a TezipError subclass
whose message says what went wrong and what to do about it."""

from __future__ import annotations


class TezipError(Exception):
    """Base class of every error tezip raises on purpose."""


class InputError(TezipError):
    """The input cannot be read: missing file, unknown format, wrong dataset path."""


class UnsupportedError(TezipError):
    """The input is readable but holds something tezip does not handle (dtype, rank)."""


class OptionError(TezipError):
    """An option has a value that makes no sense (negative bound, unknown mode)."""


class OutputError(TezipError):
    """The output cannot be written: missing directory, no permission, disk full."""


class CorruptFileError(TezipError):
    """A .tez file is damaged or truncated: a checksum or a structural check failed."""


class FormatVersionError(TezipError):
    """A .tez file was written by a newer format version than this reader knows."""


class OutputExistsError(TezipError):
    """The output exists and was left alone: --force was not given, or it is something
    tezip never replaces (a directory where a file goes, a device, a FIFO, a socket), or
    it appeared while tezip was writing."""


class DecodeMismatchError(TezipError):
    """The decoder could not reproduce what the encoder recorded (different model,
    different machine arithmetic); returning data would risk breaking the bound."""
