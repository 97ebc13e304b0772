"""The ``client`` attribute the torch layer's objects share: the client they were given, else
the process's default client (:func:`tier.default_client`), taken when first used."""

from .. import client as _client


class DefaultClient:
    """A class attribute ``client = DefaultClient()`` reads the instance's ``_client``, filling
    it with the default client the first time it is None."""

    __slots__ = ()

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        c = obj._client
        if c is None:
            c = obj._client = _client.default_client()
        return c
