from warmcache.cli import main

main(prog_name="warmcache")
