"""What ``cockpit check`` verifies before a run (and ``cockpit train`` before it launches):
``checks`` (config, devices, model, SFT data and truncation), ``stage`` (the same for pt / dpo /
kto / rm, their data read the way their trainers will). Above config, data, models, doctor and
device; below run and the commands. Never imported by the UI process (it runs ``cockpit check
--json``); imports transformers lazily, for the tokenizer."""
