"""treegym: forkable ReAct environments and tree-search RL trainers for LLM agents.

Importing the package registers its environments with gymnasium, so that
``gym.make("TreeSearchQA-v0")`` works after ``import treegym``.
"""

from treegym.envs import fork, register_envs

__version__ = "0.1.0"

register_envs()

__all__ = ["__version__", "fork", "register_envs"]
