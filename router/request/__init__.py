"""What a request is: its facts read from the body and head (fields, tokens, multipart forms and audio
headers), and the rewrites applied before it is forwarded. Pure readers: it may import config/,
observe/ and the flat base modules only."""
