from ponytail.entry import run

run()
