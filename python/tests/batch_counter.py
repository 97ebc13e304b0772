"""Counting the client library's batch calls, for tests that check what went as one batch.

`install(client)` puts a CountingLib in place of the client's library (restored by `restore`);
CountingLib records the size of every tier_offload_batch / tier_reload_batch call and can fail the
n-th one without calling the library, to test what a failed later batch leaves behind."""

import collections

from tier import errors

BATCH_CALLS = ("tier_offload_batch", "tier_reload_batch", "tier_offload_ranges",
               "tier_reload_ranges")


class CountingLib:
    """Stands in for the client's CDLL; `sizes[name]` lists the size of each batch call."""

    def __init__(self, lib, fail_call=None):
        self._lib = lib
        self.sizes = collections.defaultdict(list)
        self._fail_call = fail_call  # (name, call number from 1)

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if name not in BATCH_CALLS:
            return fn

        def call(session, jobs, count, options):
            self.sizes[name].append(int(count))
            if self._fail_call == (name, len(self.sizes[name])):
                return errors.INTERNAL
            return fn(session, jobs, count, options)
        return call


class Installer:
    """Callable as counted(client, fail_call=None) -> CountingLib; restore() undoes every one."""

    def __init__(self):
        self._patched = []

    def __call__(self, client, fail_call=None):
        session = client._session  # every C call of the client goes through session.lib
        counter = CountingLib(session.lib, fail_call)
        self._patched.append((session, session.lib))
        session.lib = counter
        return counter

    def restore(self):
        for session, lib in reversed(self._patched):
            session.lib = lib
        self._patched.clear()
