"""The files a run leaves, read back: the perturbation log (`logfile`) and a drill's folder
(`drill_folder`). Both drills (which write and then read them) and reports (which only read them) use
these formats, so they live below both. May import: telemetry (the log's schema), protocols (to name
what a line was about) and errors; never the engine, faults, adapters, control, drill, report or cli."""
