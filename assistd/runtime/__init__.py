"""The runtime: the one object that every front end drives (Target, history, tuner,
scheduler, KV sequences), and the helpers front ends share."""
