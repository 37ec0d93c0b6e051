"""What watches a run as it trains: ``watch`` hooks the optimizer's steps and sees every
per-step record (resume health, state changed after a save), ``fingerprint`` adds the
registered modules' parameters and buffers to the record every few steps for the
self-check, and ``loaderstarts`` notices DataLoader iterators started while a run is
watched.
"""
