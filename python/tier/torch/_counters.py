"""Counters: the base of the offloaders' ``stats`` objects (named fields, all 0 at first)."""


class Counters:
    """Subclasses list their fields in ``__slots__``; every one starts at 0."""

    __slots__ = ()

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__,
                           ", ".join("%s=%d" % kv for kv in self.as_dict().items()))
