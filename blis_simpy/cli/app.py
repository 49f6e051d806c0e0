def main():
    raise SystemExit("CLI not built yet")
