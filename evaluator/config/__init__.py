"""Configuration: the TOML file, ``EVALUATOR_*`` environment overrides and flags,
validated into :class:`Settings` (:mod:`evaluator.config.load`, whose public names
this package exports); the sections are in :mod:`evaluator.config.settings`,
:mod:`evaluator.config.ab` and :mod:`evaluator.config.services`."""

from evaluator.config import load
from evaluator.config.load import *  # noqa: F403 - the package's face is load's __all__

__all__ = load.__all__
