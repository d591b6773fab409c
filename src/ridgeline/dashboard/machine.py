"""The machine a roofline is drawn for: a catalogue entry by name, or this machine as `ridgeline measure` cached it
for the engine's thread count (as `ridgeline roofline --hardware` and `bench latency` pick it)."""

from ridgeline.napkin.hardware import THIS_MACHINE, Hardware, catalogued


def machine_named(name: str, threads: int | None = None) -> Hardware:
    """The roof to draw: this machine's cached entry for `threads` (None: torch's), else measured now (the
    dashboard's first view, once per thread count; `serve` only says so at start-up: see roof_note)."""
    if name == THIS_MACHINE:
        from ridgeline.machine.this_machine import this_machine  # measures with torch; catalogued machines need none

        return this_machine(threads=threads)
    return catalogued(name)


def roof_note(name: str) -> str:
    """What /dashboard will draw its roof from, read without measuring anything (a `serve` start never measures:
    it would cost ~5 s a start, and beside the engine's start-up work it reads the machine far below its best)."""
    if name != THIS_MACHINE:
        return f"roofline of {catalogued(name).title}"
    from ridgeline.machine.this_machine import cached, default_threads

    entry = cached()
    if entry is not None:
        return f"roofline of {entry.hardware.title}"
    threads = default_threads(None)
    return (f"this machine is not measured with {threads} threads: the first /dashboard view measures it (~7 s, "
            f"then cached); `ridgeline measure --threads {threads}` measures it now")
