"""Offline improvement of chunk policies from their own rollouts: chunk transitions of a replay buffer
(:mod:`.transitions`), Q-VGM (:mod:`.qvgm`), best-of-N reranking (:mod:`.rerank`)."""
