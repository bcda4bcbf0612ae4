"""Named parts of a step a profiler can observe: `region(name)` runs inside `observe`'s factory(name), if any."""
import contextlib

LM_HEAD, DECODE = "lm_head", "decode"
_factory = None


def observe(factory):
    """Install `factory` (a name -> context manager, None: none) for every region; returns the one it replaces."""
    global _factory
    previous, _factory = _factory, factory
    return previous


@contextlib.contextmanager
def region(name: str):
    with contextlib.nullcontext() if _factory is None else _factory(name):
        yield
