"""The learner: modules, optimisers, gradient clipping, minibatch epochs, state.

What lives here: ``learner`` (`Learner`: one or more modules and their optimisers,
``update`` over minibatch epochs, ``get_state``/``set_state``), ``learner_state`` (the
state's components and the checks of saved weights), ``minibatches`` (cutting a batch into
minibatches and micro-batches), ``nonfinite`` (the NaN/inf guard), ``gradients`` (norms and
clipping), ``optim_step`` and ``adam`` (the optimiser step and its non-finite guard),
``whole_update`` and ``mlp_backprop`` (compiled and hand-fused updates), ``learner_group``,
``process_group``, ``distributed`` and ``ray_learners`` (several learners over
torch.distributed, in processes or Ray actors).

May import: ``rlloop.errors``, ``system``, ``config``, ``logging``, ``losses``, ``envs``,
``modules`` and ``data``.
"""
