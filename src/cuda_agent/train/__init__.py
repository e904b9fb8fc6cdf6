"""Training stage: rollouts, sample building, RFT selection and the RL math.

Sub-modules are imported on demand (``from cuda_agent.train.rl import masked_gae``); this
package file imports nothing so that ``import cuda_agent.train`` never pulls in torch.
"""
