"""Corrective action-chunk execution (VLA-Corrector, arXiv 2607.01804): the latent monitor (``monitor``),
calibrated detection (``calibration``, numpy only), guided replanning (``guidance``) and the executor options
(``config``). The executor that uses them is :class:`policylink.runtime.executors.corrective.CorrectiveExecutor`."""
