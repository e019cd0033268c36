from kaudit.cli import command

command()
