"""What a request is, read from its head and body before anything is forwarded: its facts and fields,
its token estimate, multipart forms and audio headers, and the rewrites applied to it. Pure readers:
they may import config/, the API's route table (app/routes.py) and the flat base modules; never the
proxy, the runtime, the lanes or the fleet (pyproject's import contracts)."""
