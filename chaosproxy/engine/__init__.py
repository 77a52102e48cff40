"""The engine and its model: a scenario's rules, the messages they judge, the actions they return, and
the state kept per session. It knows no sockets. May import: protocols (the views it reads), faults
(what rules run), telemetry (the log it writes); never adapters, control, drill, report or cli."""
