"""The machine a roofline is drawn for: a catalogue entry by name, or this machine, measured once and cached (as
`ridgeline roofline --hardware` and `bench latency` pick it)."""

from ridgeline.napkin.hardware import THIS_MACHINE, Hardware, catalogued


def machine_named(name: str) -> Hardware:
    if name == THIS_MACHINE:
        from ridgeline.machine.this_machine import this_machine  # measures with torch; catalogued machines need none

        return this_machine()
    return catalogued(name)
