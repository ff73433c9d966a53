"""verl integration (`pip install 'srt-agent[verl]'`): the code-interpreter tool named by tools/*.yaml."""
