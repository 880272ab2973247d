"""The control plane: API, state store, reconcile loop and the dispatch of actions to node agents."""
