"""The simulated world: continuously-batching engine instances priced by a cost model (lssim.cost), the batch
route, the training phase's cost, and the per-step lower bound."""
