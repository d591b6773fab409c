"""The machine a roofline is drawn for: a catalogue entry by name, or this machine as `ridgeline measure` cached it
for the engine's thread count, else its napkin estimate titled NOT MEASURED. Nothing here measures: a dashboard view
that measured on its first load cost ~7 s and read the machine beside a busy engine (machine/this_machine.py)."""

from ridgeline.napkin.hardware import THIS_MACHINE, Hardware, catalogued


def machine_named(name: str, threads: int | None = None) -> Hardware:
    """The roof to draw: this machine's cached entry for `threads` (None: torch's), else its napkin estimate whose
    title says it is not measured and how to measure it; or a catalogued machine."""
    if name == THIS_MACHINE:
        from ridgeline.machine.this_machine import roof_named  # reads the cache (torch for the thread count)

        return roof_named(name, threads)
    return catalogued(name)


def roof_note(name: str) -> str:
    """What /dashboard will draw its roof from, read without measuring anything."""
    if name != THIS_MACHINE:
        return f"roofline of {catalogued(name).title}"
    from ridgeline.machine.this_machine import cached, default_threads

    entry = cached()
    if entry is not None:
        return f"roofline of {entry.hardware.title}"
    threads = default_threads(None)
    return (f"this machine is NOT MEASURED with {threads} threads: /dashboard draws a napkin estimate, labelled so; "
            f"`ridgeline measure --threads {threads}` measures it")
