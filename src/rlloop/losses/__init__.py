"""The algorithms' losses as pure functions of tensors, one module per family.

PPO, A2C, V-trace and APPO, DQN, SAC, TD3 and Polyak averaging, the quantile and offline
losses, each short enough to hold against its paper.

May import: nothing of rlloop (torch only), so that every loss can be read and tested alone.
"""
