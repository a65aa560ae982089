"""`python -m bench worker` (`make bench`): a plain diffusers loop vs the optimised engine vs the full worker."""
