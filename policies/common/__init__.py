"""Parts shared by several policy types: observation encoders, the conditional 1-D U-Net, the denoising samplers
(flow Euler, DDIM), the conditioning slot, EMA and real-time chunking guidance. Importing this package imports
nothing; import the module you need."""
