"""Running servers and trials: the vLLM process and its group (server), its
memory (resources), many servers at once (fleet), presets measured in turn or
side by side (sweep, trial_schedule, trial_load).

The top district: it may use launch, load and logs; none of them uses it.
"""
