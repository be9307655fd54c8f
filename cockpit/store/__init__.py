"""The run directory contract, the lowest layer: its layout, status and control files
(:mod:`cockpit.store.rundir`) and the append-only versioned event log (:mod:`cockpit.store.events`).
Every other package reads and writes runs through it; it imports nothing else of cockpit."""
