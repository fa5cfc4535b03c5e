"""The decoding core: one speculative generation (engine), its verification rule
(verify) and the tuner that picks the draft ceiling k from measured acceptance."""
