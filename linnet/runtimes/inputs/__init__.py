"""What a model reads besides token ids, made as its reference makes it: chat templates rendered into prompt text
(`chat`), images into `pixel_values` (`images`), WAV audio into Whisper's log-mel `input_features` (`audio`)."""
