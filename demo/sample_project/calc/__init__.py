def add(a, b):
    return a + b


def mean(values):
    return sum(values) / len(values)
