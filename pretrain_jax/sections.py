"""A config section as a frozen dataclass: the one boundary between a ConfigDict and the code.

Every section is one (model, train, mesh, data, a fine-tune's task, a benchmark's). `from_config`
refuses a key the dataclass lacks, naming it, and gives a key the ConfigDict lacks its field
default, so a config.json written before a field existed still loads. Construction checks each
field's type from its annotation, then the section's own `validate()`; every error is one line,
`<section>.<key>=<value>; expected <what>`. The field defaults are the one place a default
lives: configs/common.py builds its ConfigDicts from them (`to_dict`).
"""
import dataclasses
import types
import typing
from typing import ClassVar

_KINDS = {bool: 'True or False', int: 'an integer', float: 'a number', str: 'a string',
          tuple: 'a list'}


def _fits(value, kind) -> bool:
  if kind is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if kind is int:
    return isinstance(value, int) and not isinstance(value, bool)
  return isinstance(value, kind)


def _kind(annotation):
  """(type, may be None) of a field annotation: `int`, `float | None`, a Section class."""
  args = typing.get_args(annotation)
  if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
    return next(a for a in args if a is not type(None)), True
  return annotation, False


class Section:
  """Base of a frozen dataclass holding one config section.

  Subclasses set SECTION (the key in the config: 'train', 'data', ...; '' for a whole config)
  and may set PREFIX, how errors name a key (default SECTION: `train.steps=0; ...`).
  """
  SECTION: ClassVar[str] = ''
  PREFIX: ClassVar[str | None] = None

  def __post_init__(self):
    hints = typing.get_type_hints(type(self))
    for field in dataclasses.fields(self):
      kind, optional = _kind(hints[field.name])
      value = getattr(self, field.name)
      if value is None and optional:
        continue
      if kind is tuple and isinstance(value, list):   # a ConfigDict / JSON list
        object.__setattr__(self, field.name, tuple(value))
      elif kind in _KINDS:
        self.check(_fits(value, kind), field.name, _KINDS[kind])
    self.validate()

  def validate(self) -> None:
    """Checks beyond each field's type; raises ValueError through `check`."""

  def key(self, name: str) -> str:
    """How errors name field `name`."""
    prefix = self.SECTION if self.PREFIX is None else self.PREFIX
    return f'{prefix}.{name}' if prefix else name

  def check(self, ok: bool, name: str, expected: str) -> None:
    """Raises `<section>.<name>=<value>; expected <expected>` unless `ok`."""
    if not ok:
      raise ValueError(f'{self.key(name)}={getattr(self, name)!r}; expected {expected}')

  @classmethod
  def from_config(cls, section):
    """A ConfigDict section (or a dict of one, e.g. from config.json) -> this dataclass.

    Unknown keys are an error; missing keys take the field default (a required field missing
    is an error); a field whose annotation is a Section is read with that class."""
    values = dict(section.to_dict() if hasattr(section, 'to_dict') else section)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    where = f'config.{cls.SECTION}' if cls.SECTION else 'config'
    unknown = sorted(set(values) - set(fields))
    if unknown:
      raise ValueError(f'unknown {where} keys {unknown}; expected a subset of {sorted(fields)}')
    missing = sorted(name for name, f in fields.items() if name not in values
                     and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if missing:
      raise ValueError(f'{where} lacks {missing}; expected every one of them')
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
      kind, _ = _kind(hints[name])
      if isinstance(kind, type) and issubclass(kind, Section) and not isinstance(value, kind):
        values[name] = kind.from_config(value)
    return cls(**values)

  def to_dict(self) -> dict:
    """The inverse of from_config: plain values (lists for tuples, dicts for sections)."""
    out = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      out[field.name] = (value.to_dict() if isinstance(value, Section) else
                         list(value) if isinstance(value, tuple) else value)
    return out

  def replace(self, **changes):
    """A copy with `changes`, validated again."""
    return dataclasses.replace(self, **changes)
